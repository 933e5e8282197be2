/* Building an assembly (worker/serve/engine.h, cg_engine_assemble), in named phases:
 *   1. prepare:  check the segments, tokenize each on its own, compute and verify the keys;
 *   2. place:    system and chunks in prompt order: a hit is remapped into place from the
 *                pool (or the disk tier), a miss is computed at its virtual position, stored,
 *                and placed the same way (DESIGN §6);
 *   3. blend:    one token set recomputed with full causal context: EPIC's LegoLink (the
 *                first k tokens of each chunk) and a selective recompute of recompute_ratio
 *                of the chunk tokens: CacheBlend's (those whose KV deviates most) or
 *                ProphetKV's (those the question attends to most);
 *   4. finish:   the question prefilled under the mask, and the last token's logits;
 *   5. report:   the assembly made live and described to the caller.
 * The reference paths run one forward over the whole prompt instead of phases 2-4. */
#include "worker/serve/engine_state.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "kv/attn.h"

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
    if (!(req->recompute_ratio >= 0.0f && req->recompute_ratio <= 1.0f)) {
        cg_seterr(err, errlen, "recompute_ratio must be a number in [0, 1]");
        return CG_E_VALUE;
    }
    if ((unsigned)req->recompute_select > CG_SELECT_QUESTION) {
        cg_seterr(err, errlen, "recompute_select must be deviation or question");
        return CG_E_VALUE;
    }
    return CG_OK;
}

/* Working state of one assemble call. */
typedef struct job {
    cg_engine *e;
    const cg_assemble_req *req;
    uint64_t now;
    uint64_t started_ms; /* params.now_ms() at the call: how long the computing took */
    size_t n;
    int32_t **toks;
    uint32_t *lens, *offs;
    cg_role *roles;
    cg_key *keys;
    uint8_t *hit, *stored;
    uint8_t *nocache; /* split_special changed this segment's tokens: computed, never cached */
    cg_tier *tier;
    uint32_t total, s_len, max_chunk;
    cg_kv *scratch;            /* chunk misses are computed here (phase 2) */
    cg_pool_evictions ev;      /* RAM evictions */
    cg_pool_evictions dropped; /* disk records dropped by spills */
    cg_tiers_req rq;           /* the request's tier lookups */
    cg_assembly *a;
    int have_logits;     /* a->logits hold the last token's logits */
    uint32_t recomputed; /* chunk tokens recomputed in phase 3 */
    uint32_t computed;   /* segments computed in phase 2 */
    int left;            /* the client left: the forwards not yet run are not run */
    cg_engine_stats count;
} job;

/* 1 once the request's client has left (its cancel hook, asked before each forward that a
 * cold or long prompt may be made of): what is computed stays stored, the rest is not run. */
static int client_left(job *j)
{
    if (!j->left && j->req->cancelled) j->left = j->req->cancelled(j->req->cancel_ud) != 0;
    return j->left;
}

static void job_free(job *j)
{
    for (size_t i = 0; j->toks && i < j->n; i++)
        free(j->toks[i]);
    free(j->toks);
    free(j->lens);
    free(j->offs);
    free(j->roles);
    free(j->keys);
    free(j->hit);
    free(j->stored);
    free(j->nocache);
    free(j->tier);
    cg_kv_free(&j->scratch);
    cg_pool_evictions_free(&j->ev);
    cg_pool_evictions_free(&j->dropped);
}

/* Runs one forward on the scheduler (rows at slots = positions [slot, slot+n)) and counts
 * its tokens once it ran. */
static cg_status fwd(job *j, cg_kv *kv, const int32_t *t, uint32_t n, uint32_t slot,
                     cg_attn_span span, float *logits)
{
    cg_fwd_seq q = {.kv = kv,
                    .tokens = t,
                    .n = n,
                    .slot0 = slot,
                    .pos0 = slot,
                    .spans = &span,
                    .n_spans = 1,
                    .logits = logits};
    cg_status st = cg_sched_prefill(j->e->sched, &q, NULL);
    if (st == CG_OK) j->count.prefill_tokens += n;
    return st;
}

/* ---- 1. prepare ---- */

/* Each segment is tokenized on its own, so the same text always gives the same tokens and a
 * key over text identifies its KV (DESIGN §4). */
static cg_status tokenize(job *j, char *err, size_t errlen)
{
    const cg_model_config *cfg = cg_model_cfg(j->e->m);
    for (size_t i = 0; i < j->n; i++) {
        const cg_engine_seg *s = &j->req->segs[i];
        /* Only the tokens count against the positions: bytes bound them for a byte-level
         * tokenizer alone (a real one holds about 4 bytes a token, and may also give more
         * tokens than bytes), and the body's cap already bounds the work. */
        size_t n = 0;
        cg_encode_opts o = cg_encode_default_opts();
        o.add_special = s->role == CG_ROLE_SYSTEM && !j->req->no_bos;
        o.cancelled = j->req->cancelled;
        o.cancel_ud = j->req->cancel_ud;
        for (int split = 0; split <= (j->req->split_special && s->role != CG_ROLE_QUESTION);
             split++) {
            /* With split_special a segment is tokenized both ways: keys cover text, and cached
             * KV holds the text's usual tokens, so one whose special-token text splits into
             * other tokens must not meet the cache. */
            o.split_special = split;
            cg_tokens t = {0};
            cg_status st =
                cg_tokenizer_encode_opts(cg_model_tokenizer(j->e->m), s->text, s->len, &o, &t);
            if (st == CG_E_UNAVAILABLE) {
                cg_tokens_free(&t);
                cg_seterr(err, errlen, "the client left while segments were tokenized");
                return st;
            }
            if (st == CG_OK && t.n &&
                (!split || t.n != n || memcmp(t.ids, j->toks[i], n * sizeof *t.ids) != 0)) {
                j->nocache[i] = (uint8_t)split;
                free(j->toks[i]);
                j->toks[i] = t.ids; /* taken over */
                n = t.n;
                t = (cg_tokens){0};
            }
            cg_tokens_free(&t);
        }
        if (!j->toks[i]) {
            cg_seterr(err, errlen, "segments[%zu] has no token (invalid UTF-8?)", i);
            return CG_E_VALUE;
        }
        j->roles[i] = s->role;
        j->offs[i] = j->total;
        if ((uint64_t)j->total + n > (uint64_t)cfg->max_pos) {
            cg_seterr(err, errlen,
                      "the prompt needs more than the model's %d positions (%llu tokens up to "
                      "segments[%zu])",
                      cfg->max_pos, (unsigned long long)j->total + n, i);
            return CG_E_CONTEXT;
        }
        j->lens[i] = (uint32_t)n;
        j->total += j->lens[i];
        if (s->role == CG_ROLE_CHUNK) j->max_chunk = CG_MAX(j->max_chunk, j->lens[i]);
    }
    cg_status st = cg_engine_fits(cfg->max_pos, j->total, j->req->decode_tokens, err, errlen);
    if (st != CG_OK) return st;
    j->s_len = j->roles[0] == CG_ROLE_SYSTEM ? j->lens[0] : 0;
    /* in mode sys every chunk's KV follows the system segment's tokens */
    if (j->req->mode == CG_MODE_SYS && j->roles[0] == CG_ROLE_SYSTEM && j->nocache[0])
        memset(j->nocache, 1, j->n);
    return CG_OK;
}

/* Keys of every segment; a client-supplied key must name exactly its text, or it could plant
 * KV under another chunk's key. */
static cg_status key_segments(job *j, char *err, size_t errlen)
{
    const cg_model_config *cfg = cg_model_cfg(j->e->m);
    const cg_assemble_req *req = j->req;
    cg_key_seg *ks = cg_malloc(j->n * sizeof *ks);
    for (size_t i = 0; i < j->n; i++)
        ks[i] = (cg_key_seg){req->segs[i].role, req->segs[i].text, req->segs[i].len};
    cg_key_scope scope = {cfg->model_id, strlen(cfg->model_id), req->mode,
                          req->salt,     req->salt_len,         req->no_bos};
    cg_key_request(&scope, ks, j->n, 1, j->keys);
    free(ks);
    for (size_t i = 0; i < j->n; i++) {
        const cg_key *given = req->segs[i].key;
        if (given && !cg_key_equal(given, &j->keys[i])) {
            char want[CG_KEY_HEX_LEN + 1];
            cg_key_hex(&j->keys[i], want);
            cg_seterr(err, errlen, "segments[%zu].key does not match its text (expected %s)", i,
                      want);
            return CG_E_KEY_MISMATCH;
        }
    }
    return CG_OK;
}

static cg_status prepare(job *j, char *err, size_t errlen)
{
    const size_t n = j->n;
    j->toks = cg_calloc(n, sizeof *j->toks);
    j->lens = cg_calloc(n, sizeof *j->lens);
    j->offs = cg_calloc(n, sizeof *j->offs);
    j->roles = cg_calloc(n, sizeof *j->roles);
    j->keys = cg_calloc(n, sizeof *j->keys);
    j->hit = cg_calloc(n, 1);
    j->stored = cg_calloc(n, 1);
    j->nocache = cg_calloc(n, 1);
    j->tier = cg_calloc(n, sizeof *j->tier);
    cg_status st = tokenize(j, err, errlen);
    return st == CG_OK ? key_segments(j, err, errlen) : st;
}

/* The assembly's KV, its prompt tokens and its chunk room. */
static cg_status new_assembly(job *j, char *err, size_t errlen)
{
    cg_engine *e = j->e;
    const cg_model_config *cfg = cg_model_cfg(e->m);
    if (!j->req->internal && cg_live_full(e->live, j->now)) {
        cg_seterr(err, errlen, "%zu assemblies are live (the limit); consume or release some",
                  e->p.max_assemblies);
        return CG_E_UNAVAILABLE;
    }
    int64_t reserve =
        j->req->reserve_tokens < 0 ? (int64_t)e->p.reserve_tokens : j->req->reserve_tokens;
    uint64_t cap = CG_MIN((uint64_t)j->total + (uint64_t)reserve, (uint64_t)cfg->max_pos);
    j->a = cg_live_prepare(e->live, j->total, (uint32_t)CG_MAX(cap, 1), j->n);
    if (!j->a) return CG_E_INTERNAL;
    j->a->tokens = cg_malloc(((size_t)j->total + 1) * sizeof(int32_t));
    for (size_t i = 0; i < j->n; i++)
        memcpy(j->a->tokens + j->offs[i], j->toks[i], j->lens[i] * sizeof(int32_t));
    return CG_OK;
}

/* ---- reference paths ---- */

/* One forward over the whole prompt at true positions: the ground truth the cached path is
 * compared with (under the segment mask, or plain causal). */
static cg_status run_reference(job *j)
{
    cg_attn_span *spans = cg_calloc(j->n, sizeof *spans);
    size_t ns = 1;
    if (j->req->path == CG_PATH_REFERENCE)
        ns = cg_attn_plan(j->roles, j->lens, j->n, j->req->mode, spans);
    else
        spans[0] = (cg_attn_span){0, j->total, 0, 0};
    j->count.prefill_tokens += j->total;
    cg_fwd_seq q = {.kv = j->a->kv,
                    .tokens = j->a->tokens,
                    .n = j->total,
                    .spans = spans,
                    .n_spans = ns,
                    .logits = j->a->logits};
    cg_status st = cg_sched_prefill(j->e->sched, &q, NULL);
    free(spans);
    return st;
}

/* ---- 2. place ---- */

/* A hit: the system segment sits at its virtual position already (delta 0); a chunk was
 * computed at v = 0 (strict) or v = s (sys). */
static void place_hit(job *j, size_t i, cg_cached *hit)
{
    int64_t v = j->roles[i] == CG_ROLE_SYSTEM ? 0 : j->req->mode == CG_MODE_SYS ? j->s_len : 0;
    cg_tiers_place(j->e->tiers, j->a->kv, j->offs[i], hit, (int64_t)j->offs[i] - v);
    if (hit->c) {
        j->a->chunks[j->a->n_chunks++] = hit->c;
        hit->c = NULL;
    }
    cg_tiers_drop(j->e->tiers, hit, j->now);
    j->hit[i] = 1;
    j->tier[i] = hit->tier;
    j->count.chunk_hits++;
    j->count.disk_hits += hit->tier == CG_TIER_DISK;
    j->count.remote_hits += hit->tier == CG_TIER_REMOTE;
    j->count.tokens_reused += j->lens[i];
}

/* A system miss: plain causal at slot 0, its virtual position. */
static cg_status compute_system(job *j, size_t i, float *lg, int cached)
{
    const uint32_t len = j->lens[i];
    cg_status st = fwd(j, j->a->kv, j->toks[i], len, 0, (cg_attn_span){0, len, 0, 0}, lg);
    if (st != CG_OK) return st;
    j->have_logits |= lg != NULL;
    cg_pool_chunk *c = NULL;
    if (cached &&
        cg_tiers_store(j->e->tiers, &j->keys[i], j->a->kv, 0, len, j->now, &j->ev, &c) == CG_OK) {
        j->a->chunks[j->a->n_chunks++] = c;
        j->stored[i] = 1;
    }
    return CG_OK;
}

/* A chunk miss is computed where it will be stored: alone at v = 0 (strict), or right after
 * the system segment at v = s (sys), in a scratch KV; then placed like a hit. */
static cg_status compute_chunk(job *j, size_t i, int cached)
{
    const uint32_t p = j->offs[i], len = j->lens[i];
    const uint32_t v = j->req->mode == CG_MODE_SYS ? j->s_len : 0;
    if (!j->scratch) {
        j->scratch = cg_kv_new(j->e->m, v + j->max_chunk);
        if (v) cg_kv_copy_slots(j->scratch, j->a->kv, v);
    }
    cg_status st = fwd(j, j->scratch, j->toks[i], len, v, (cg_attn_span){v, len, v, v}, NULL);
    if (st != CG_OK) return st;
    cg_pool_chunk *c = NULL;
    if (cached &&
        cg_tiers_store(j->e->tiers, &j->keys[i], j->scratch, v, len, j->now, &j->ev, &c) == CG_OK) {
        j->a->chunks[j->a->n_chunks++] = c;
        cg_tiers_place_chunk(j->e->tiers, j->a->kv, p, c, (int64_t)p - v);
        j->stored[i] = 1;
    } else {
        cg_tiers_place_rows(j->e->tiers, j->a->kv, p, j->scratch, v, len, (int64_t)p - v);
    }
    return CG_OK;
}

static cg_status place(job *j)
{
    const size_t last = j->n - 1;
    for (size_t i = 0; i < j->n; i++) {
        if (j->roles[i] == CG_ROLE_QUESTION) continue; /* phase 4 */
        const int cached = j->req->path == CG_PATH_CACHED && !j->nocache[i];
        cg_cached hit;
        /* Keys carry no role: a system text equal to a chunk text has the same strict key
         * but one more token (BOS); lookup refuses a chunk of another length. */
        if (cached && cg_tiers_lookup(j->e->tiers, &j->keys[i], j->lens[i], j->now, &j->ev, &j->rq,
                                      &hit) == CG_OK) {
            place_hit(j, i, &hit);
            continue;
        }
        if (cached) j->count.chunk_misses++;
        if (client_left(j)) return CG_E_UNAVAILABLE;
        cg_status st = j->roles[i] == CG_ROLE_SYSTEM
                           ? compute_system(j, i, i == last ? j->a->logits : NULL, cached)
                           : compute_chunk(j, i, cached);
        if (st != CG_OK) return st;
        j->computed++;
    }
    return CG_OK;
}

/* ---- 3. blend ---- */

/* The layer whose KV ranks the tokens. Layer 0's K and V depend only on the token and its
 * position, so after the remap they already equal a full-attention pass; the context a chunk
 * missed first shows in layer 1's (CacheBlend ranks on an early layer too). */
static int rank_layer(const cg_model_config *c)
{
    return c->n_layers > 1 ? 1 : 0;
}

typedef struct ranked {
    double score;
    uint32_t slot;
} ranked;

/* Highest score (deviation, attention) first; equal scores in prompt order, so the choice is
 * deterministic. */
static int by_score(const void *pa, const void *pb)
{
    const ranked *a = pa, *b = pb;
    if (a->score != b->score) return a->score < b->score ? 1 : -1;
    return a->slot < b->slot ? -1 : a->slot > b->slot;
}

/* Marks in sel (indexed by slot) the want best scored of the n ranked tokens r. */
static void mark_top(ranked *r, uint32_t n, uint32_t want, uint8_t *sel)
{
    qsort(r, n, sizeof *r, by_score);
    for (uint32_t t = 0; t < want; t++)
        sel[r[t].slot] = 1;
}

/* Ranks the n chunk tokens in slots [c0, c0 + n) (the chunks lie back to back) by how far
 * their K and V at rank_layer deviate from a full-attention pass: one forward over them with
 * plain causal attention that stops at that layer (its lower layers rewrite the same K/V),
 * compared with the placed KV. Marks the want most deviating in sel (indexed by slot). */
static cg_status rank_tokens(job *j, uint32_t c0, uint32_t n, uint32_t want, uint8_t *sel)
{
    const cg_model_config *c = cg_model_cfg(j->e->m);
    const size_t hd = (size_t)c->head_dim, kvd = (size_t)c->n_kv_heads * hd;
    const int L = rank_layer(c);
    float *k = cg_malloc((size_t)n * kvd * sizeof(float));
    float *v = cg_malloc((size_t)n * kvd * sizeof(float));
    ranked *r = cg_malloc((size_t)n * sizeof *r);
    cg_attn_span span = {c0, n, 0, 0};
    cg_fwd_seq q = {.kv = j->a->kv,
                    .tokens = j->a->tokens + c0,
                    .n = n,
                    .slot0 = c0,
                    .pos0 = c0,
                    .spans = &span,
                    .n_spans = 1,
                    .stop_layer = L,
                    .stop_k = k,
                    .stop_v = v};
    j->count.rank_tokens += n; /* a layer or two each: not counted as prefill */
    cg_status st = cg_sched_prefill(j->e->sched, &q, NULL);
    if (st == CG_OK) {
        for (uint32_t t = 0; t < n; t++) {
            double d = 0;
            for (int h = 0; h < c->n_kv_heads; h++) {
                const float *pk = cg_kv_k(j->a->kv, L, h) + (size_t)(c0 + t) * hd;
                const float *pv = cg_kv_v(j->a->kv, L, h) + (size_t)(c0 + t) * hd;
                const float *fk = k + (size_t)t * kvd + (size_t)h * hd;
                const float *fv = v + (size_t)t * kvd + (size_t)h * hd;
                for (size_t i = 0; i < hd; i++) {
                    double dk = (double)fk[i] - pk[i], dv = (double)fv[i] - pv[i];
                    d += dk * dk + dv * dv;
                }
            }
            r[t] = (ranked){d, c0 + t};
        }
        mark_top(r, n, want, sel);
    }
    free(k);
    free(v);
    free(r);
    return st;
}

/* Ranks the chunk tokens in slots [c0, c1) by the attention the question (the last segment,
 * at slot q0, nq tokens) pays them: one forward of the question over the placed KV that keeps
 * its queries in every layer (the finish phase computes the question again, after the
 * recompute), then per layer the softmax of every query head over slots [0, c1), summed per
 * slot. Marks the want most attended in sel (indexed by slot). */
static cg_status rank_by_question(job *j, uint32_t c0, uint32_t c1, uint32_t want, uint8_t *sel)
{
    const cg_model_config *c = cg_model_cfg(j->e->m);
    const size_t last = j->n - 1, hd = (size_t)c->head_dim, QD = (size_t)c->n_heads * hd;
    const uint32_t q0 = j->offs[last], nq = j->lens[last];
    float *qs = cg_malloc((size_t)nq * (size_t)c->n_layers * QD * sizeof(float));
    cg_attn_span span = {q0, nq, 0, 0};
    cg_fwd_seq q = {.kv = j->a->kv,
                    .tokens = j->toks[last],
                    .n = nq,
                    .slot0 = q0,
                    .pos0 = q0,
                    .spans = &span,
                    .n_spans = 1,
                    .capture_q = qs};
    j->count.rank_tokens += nq;
    cg_status st = cg_sched_prefill(j->e->sched, &q, NULL);
    if (st == CG_OK) {
        double *mass = cg_calloc(c1, sizeof *mass);
        const size_t stride = (size_t)cg_kv_cap(j->a->kv) * hd, NL = (size_t)c->n_layers;
        for (int l = 0; l < c->n_layers; l++) {
            cg_attn_kv akv = {cg_kv_k(j->a->kv, l, 0), cg_kv_v(j->a->kv, l, 0), stride,
                              c->n_kv_heads, (int)hd};
            cg_attn_key_mass(&akv, c->n_heads, qs + (size_t)l * QD, NL * QD, nq, c1, mass);
        }
        ranked *r = cg_malloc((size_t)(c1 - c0) * sizeof *r);
        for (uint32_t s = c0; s < c1; s++)
            r[s - c0] = (ranked){mass[s], s};
        mark_top(r, c1 - c0, want, sel);
        free(r);
        free(mass);
    }
    free(qs);
    return st;
}

/* The chosen chunk tokens (LegoLink's first k of each chunk; with r > 0 also the round(r * N)
 * that recompute_select ranks first and the last token of a prompt that ends in a chunk) are
 * recomputed in every layer with full causal attention over the whole sequence, in one forward
 * of scattered rows in prompt order (one pass over the weights for every chunk): within a
 * layer every row writes its K/V before any attends, so a row sees the rows recomputed before
 * it, as a plain causal pass would. The pool keeps the isolated version. */
static cg_status blend(job *j)
{
    const float r = j->req->recompute_ratio;
    const uint32_t k = j->req->recompute_prefix_tokens;
    if (r <= 0 && !k) return CG_OK;
    uint32_t c0 = UINT32_MAX, c1 = 0, n = 0;
    for (size_t i = 0; i < j->n; i++)
        if (j->roles[i] == CG_ROLE_CHUNK) {
            c0 = CG_MIN(c0, j->offs[i]);
            c1 = CG_MAX(c1, j->offs[i] + j->lens[i]);
            n += j->lens[i];
        }
    if (!n) return CG_OK;
    uint8_t *sel = cg_calloc(j->total, 1);
    uint32_t want = (uint32_t)CG_MIN((double)n, floor((double)r * n + 0.5));
    cg_status st = CG_OK;
    if (want == n) {
        memset(sel + c0, 1, n);
    } else if (want && j->req->recompute_select == CG_SELECT_QUESTION &&
               j->roles[j->n - 1] == CG_ROLE_QUESTION) {
        st = rank_by_question(j, c0, c1, want, sel);
    } else if (want) {
        st = rank_tokens(j, c0, c1 - c0, want, sel);
    }
    for (size_t i = 0; i < j->n; i++)
        if (j->roles[i] == CG_ROLE_CHUNK) memset(sel + j->offs[i], 1, CG_MIN(k, j->lens[i]));
    if (r > 0 && j->roles[j->n - 1] == CG_ROLE_CHUNK) sel[j->total - 1] = 1;
    uint32_t rows = 0, runs = 0;
    for (uint32_t s = c0; s < c1; s++) {
        rows += sel[s];
        runs += sel[s] && (s == c0 || !sel[s - 1]);
    }
    if (st != CG_OK || !rows) {
        free(sel);
        return st;
    }
    uint32_t *slots = cg_malloc(rows * sizeof *slots);
    int64_t *pos = cg_malloc(rows * sizeof *pos);
    int32_t *toks = cg_malloc(rows * sizeof *toks);
    cg_attn_span *spans = cg_malloc(runs * sizeof *spans);
    uint32_t t = 0, ns = 0;
    for (uint32_t s = c0; s < c1; s++) {
        if (!sel[s]) continue;
        if (s == c0 || !sel[s - 1]) spans[ns++] = (cg_attn_span){s, 0, 0, 0};
        spans[ns - 1].q_len++;
        slots[t] = s;
        pos[t] = s;
        toks[t++] = j->a->tokens[s];
    }
    const int last = slots[rows - 1] == j->total - 1;
    cg_fwd_seq q = {.kv = j->a->kv,
                    .tokens = toks,
                    .n = rows,
                    .slots = slots,
                    .pos = pos,
                    .spans = spans,
                    .n_spans = ns,
                    .logits = last ? j->a->logits : NULL};
    j->count.prefill_tokens += rows;
    st = cg_sched_prefill(j->e->sched, &q, NULL);
    if (st == CG_OK) {
        j->recomputed = rows;
        if (last) j->have_logits = 1; /* recomputed with full context */
    }
    free(slots);
    free(pos);
    free(toks);
    free(spans);
    free(sel);
    return st;
}

/* ---- 4. finish ---- */

static cg_status finish(job *j)
{
    const size_t last = j->n - 1;
    if (j->roles[last] == CG_ROLE_QUESTION) {
        cg_status st = fwd(j, j->a->kv, j->toks[last], j->lens[last], j->offs[last],
                           (cg_attn_span){j->offs[last], j->lens[last], 0, 0}, j->a->logits);
        if (st != CG_OK) return st;
        j->have_logits = 1;
    }
    if (j->have_logits) return CG_OK;
    /* The prompt ends in a segment taken from the pool: run its last token again, under the
     * span it had, to get the logits (its K/V come out the same). */
    uint32_t slot = j->total - 1;
    cg_attn_span sp = {slot, 1, 0, 0};
    if (j->roles[last] == CG_ROLE_CHUNK) {
        sp.own_start = j->offs[last];
        sp.prefix = j->req->mode == CG_MODE_SYS ? j->s_len : 0;
    }
    return fwd(j, j->a->kv, j->toks[last] + j->lens[last] - 1, 1, slot, sp, j->a->logits);
}

/* ---- 5. report ---- */

/* The segments of the answer, and what left RAM meanwhile. */
static void describe(job *j, cg_assembly_info *out)
{
    out->segs = cg_calloc(j->n, sizeof *out->segs);
    out->n_segs = j->n;
    for (size_t i = 0; i < j->n; i++) {
        cg_engine_seg_result *r = &out->segs[i];
        r->key = j->keys[i];
        r->role = j->roles[i];
        r->offset = j->offs[i];
        r->n_tokens = j->lens[i];
        r->hit = j->hit[i];
        r->stored = j->stored[i];
        r->tier = j->tier[i];
    }
    out->n_tokens = j->total;
    out->cached_tokens = (uint32_t)j->count.tokens_reused;
    out->computed_tokens = (uint32_t)j->count.prefill_tokens;
    out->recomputed_tokens = j->recomputed;
    out->ttl_ms = j->e->p.assembly_ttl_ms;
    /* and the disk records the write-behind dropped meanwhile (reported by whichever request
     * comes next) */
    cg_tiers_take_dropped(j->e->tiers, &j->dropped);
    size_t nd = j->ev.n + j->dropped.n;
    if (!nd) return;
    cg_key *left = cg_malloc(nd * sizeof *left);
    if (j->ev.n) memcpy(left, j->ev.keys, j->ev.n * sizeof *left); /* keys NULL when n is 0 */
    if (j->dropped.n) memcpy(left + j->ev.n, j->dropped.keys, j->dropped.n * sizeof *left);
    out->evicted = cg_malloc(nd * sizeof *out->evicted);
    out->spilled = cg_malloc(nd * sizeof *out->spilled);
    cg_tiers_classify(j->e->tiers, left, nd, out->evicted, &out->n_evicted, out->spilled,
                      &out->n_spilled);
    free(left);
}

static cg_status report(job *j, cg_assembly_info *out, char *err, size_t errlen)
{
    const cg_model_config *cfg = cg_model_cfg(j->e->m);
    j->a->cached_tokens = (uint32_t)j->count.tokens_reused;
    j->a->assembled = 1;
    j->a->mode = j->req->mode;
    j->a->recompute_ratio = j->req->recompute_ratio;
    j->a->recompute_select = j->req->recompute_select;
    j->a->recompute_prefix = j->req->recompute_prefix_tokens;
    j->a->recomputed = j->recomputed;
    if (j->req->logits_out)
        memcpy(j->req->logits_out, j->a->logits, (size_t)cfg->vocab_size * sizeof(float));
    /* The ttl runs from when the assembly is ready: a cold prompt can take longer to compute
     * than the ttl (4.5k tokens of Qwen2.5-0.5B took 97 s on a loaded 2-core machine), and
     * counting from the request's arrival expired it the moment it was made. */
    uint64_t ready = j->now + (j->e->p.now_ms ? j->e->p.now_ms() - j->started_ms : 0);
    cg_status st =
        cg_live_add(j->e->live, &j->a, ready, j->req->internal ? CG_LIVE_UNCAPPED : 0, out->id);
    if (st != CG_OK) {
        cg_seterr(err, errlen, "%zu assemblies are live (the limit); consume or release some",
                  j->e->p.max_assemblies);
        return st;
    }
    describe(j, out);
    return CG_OK;
}

/* Phases 2-4 (or the reference forward); the forwards run on the scheduler. */
static cg_status compute(job *j)
{
    cg_tiers_collect(j->e->tiers, &j->dropped);
    cg_status st;
    if (j->req->path == CG_PATH_REFERENCE || j->req->path == CG_PATH_CAUSAL) {
        st = run_reference(j);
    } else {
        st = place(j);
        if (st == CG_OK) st = client_left(j) ? CG_E_UNAVAILABLE : blend(j);
        if (st == CG_OK) st = client_left(j) ? CG_E_UNAVAILABLE : finish(j);
    }
    cg_tiers_collect(j->e->tiers, NULL);
    return st;
}

cg_status cg_engine_assemble(cg_engine *e, const cg_assemble_req *req, uint64_t now,
                             cg_assembly_info *out, char *err, size_t errlen)
{
    job j = {.e = e, .req = req, .now = now, .n = req->n_segs};
    if (e->p.now_ms) j.started_ms = e->p.now_ms();
    memset(out, 0, sizeof *out);
    if (err && errlen) err[0] = '\0';
    cg_status st = check_segments(req, err, errlen);
    if (st == CG_OK) st = prepare(&j, err, errlen);
    if (st == CG_OK) st = new_assembly(&j, err, errlen);
    if (st == CG_OK) st = compute(&j);
    if (st == CG_E_UNAVAILABLE && j.left) {
        cg_log(CG_LOG_INFO,
               "client left while the prompt was computed: %u of %zu segments computed, the rest "
               "not",
               j.computed, j.n);
        cg_seterr(err, errlen,
                  "the client left while the prompt was computed: %u segments were computed "
                  "(and stored when cacheable), the rest not",
                  j.computed);
    }
    if (st == CG_OK) st = report(&j, out, err, errlen);
    /* Evictions and forwards happened even when the request failed (a client that left, a
     * full pool): keep those counts exact. */
    cg_engine_stats add = {.evictions = j.ev.n, .prefill_tokens = j.count.prefill_tokens};
    if (st == CG_OK) {
        add = j.count;
        add.evictions = j.ev.n;
        add.tokens_computed = j.total - j.count.tokens_reused;
        add.recomputed_tokens = j.recomputed;
    }
    cg_engine_count(e, &add);
    cg_live_discard(e->live, &j.a, now);
    job_free(&j);
    if (st != CG_OK) cg_assembly_info_free(out);
    return st;
}
